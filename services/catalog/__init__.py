"""The catalog service: the durable, totally ordered record of what exists.

- :mod:`.items`: one item on its own (key, kind, namespaces, well-formedness);
- :mod:`.index`: the contents at one time, indexed for validation; steps of change;
- :mod:`.validation`: checking an append against the contents at its expected upper;
- :mod:`.history`: the current contents plus recent steps, for reads at past times;
- :mod:`.log`: the durable log the catalog needs, and an in-memory one for tests;
- :mod:`.storage_log`: that log on the storage service;
- :mod:`.catalog`: compare-and-append, snapshots, subscriptions, following, maintenance;
- :mod:`.service`: the gRPC servicer; ``__main__``: the process.
"""
