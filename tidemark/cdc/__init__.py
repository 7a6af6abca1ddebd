"""CDCv2: writing down and reading back a changing collection's history as messages that may
be duplicated, reordered and re-batched in transit.

A history is stated with two kinds of message, each true forever once written: ``Updates``
(each ``(data, time, diff)`` at most once, fully accumulated) and ``Progress`` (how many
distinct updates each time in an interval has). ``write_history``/``CdcWriter`` produce them;
``CdcReader``/``read_cdc`` put the history back together, in frontier order, holding only
what has not been reported yet. ``tidemark.cdc.proto`` converts to and from the wire.
"""

from tidemark.cdc.messages import Message, Progress, Updates
from tidemark.cdc.reader import CdcReader, Report, read_cdc, read_cdc_async
from tidemark.cdc.writer import CdcWriter, interval_chain, interval_messages, write_history
from tidemark.updates import Update

__all__ = [
    "CdcReader",
    "CdcWriter",
    "Message",
    "Progress",
    "Report",
    "Update",
    "Updates",
    "interval_chain",
    "interval_messages",
    "read_cdc",
    "read_cdc_async",
    "write_history",
]
