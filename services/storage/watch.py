"""Pushing shard state changes to the subscribers of this process.

One consensus watch per shard serves every local subscriber of that shard; commits made by
this process are offered directly as well, so a local subscriber hears of a local append
without waiting for the watch. Subscribers see the newest state, never an older one after a
newer one, and may skip intermediate states (each state holds everything the skipped ones did).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from services.storage.shards import ShardStore, Versioned
from tidemark.change_signal import ChangeSignal
from tidemark.errors import NotFound, TidemarkError, Unavailable
from tidemark.logging import get_logger
from tidemark.tasks import cancel_and_wait

log = get_logger("storage.watch")


class _Feed:
    def __init__(self) -> None:
        self.latest: Versioned | None = None
        self.error: TidemarkError | None = None
        self.signal = ChangeSignal()
        self.watchers = 0
        self.task: asyncio.Task[None] | None = None

    def offer(self, versioned: Versioned) -> None:
        if self.latest is None or self.latest.version < versioned.version:
            self.latest = versioned
            self.signal.notify()


class ShardWatch:
    def __init__(self, shards: ShardStore) -> None:
        self.shards = shards
        self._feeds: dict[str, _Feed] = {}

    def offer(self, collection_id: str, versioned: Versioned) -> None:
        """A state this process read or wrote; passed on if it is news to the subscribers."""
        feed = self._feeds.get(collection_id)
        if feed is not None:
            feed.offer(versioned)

    async def states(self, collection_id: str, *, at_least: int = 0) -> AsyncIterator[Versioned]:
        """The shard's newest state of version ``at_least`` or later as soon as there is one,
        then each newer state as it is committed. Ends only when the caller stops iterating;
        raises if the collection disappears or the watch cannot start."""
        feed = self._feeds.get(collection_id)
        if feed is None:
            feed = self._feeds[collection_id] = _Feed()
            feed.task = asyncio.create_task(self._follow(collection_id, feed))
        feed.watchers += 1
        seen = at_least - 1
        try:
            while True:
                token = feed.signal.token
                latest = feed.latest
                if latest is not None and latest.version > seen:
                    seen = latest.version
                    yield latest
                    continue
                if feed.error is not None:
                    raise feed.error
                await feed.signal.wait_past(token)
        finally:
            feed.watchers -= 1
            if feed.watchers == 0 and self._feeds.get(collection_id) is feed:
                del self._feeds[collection_id]
                if feed.task is not None:
                    feed.task.cancel()

    async def _follow(self, collection_id: str, feed: _Feed) -> None:
        key = self.shards.key(collection_id)
        try:
            async for data in self.shards.consensus.watch(key):
                if data is None:
                    feed.error = NotFound(f"collection {collection_id} does not exist")
                    feed.signal.notify()
                    continue
                feed.offer(self.shards.decode(collection_id, data))
            feed.error = Unavailable("the consensus store closed")
        except asyncio.CancelledError:
            raise
        except TidemarkError as exc:
            feed.error = exc
        except Exception as exc:  # the watch must not die silently under its subscribers
            log.exception("watch_failed", collection=collection_id)
            feed.error = Unavailable(f"watching collection {collection_id} failed: {exc}")
        feed.signal.notify()

    async def close(self) -> None:
        feeds = list(self._feeds.values())
        self._feeds.clear()
        await cancel_and_wait(*(feed.task for feed in feeds if feed.task is not None))
