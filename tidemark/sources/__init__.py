"""Sources: readers of upstream systems that the sources process ingests."""
