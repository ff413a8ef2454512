"""A process's mirror of which origins have unhealthy scopes in Redis, kept by pub/sub.

Every change to an origin's set of scopes is published by the script (see
`scripts`): ``<origin hash> <1|0> <sequence>``, the sequence being
that origin's own (news of one origin is ordered by it). A listener thread
subscribes, then reads the origins that have unhealthy scopes (a snapshot),
then applies each message newer than what it knows. While the mirror is
live, a request to an origin it holds healthy is admitted without a round
trip, and its success needs none either.

The mirror is never trusted stale: until the snapshot is read, and from
the moment the subscription is found lost (the connection breaks, or a
ping goes unanswered for ``heartbeat`` seconds) until it is read again,
the mirror is not live and every admission asks Redis as before. What the
store itself learns from a reply counts at once: an origin a reply shows
unhealthy is marked so before the caller sees the reply.

The thread is a daemon, started by the first admission (so building a
store does no I/O), started again in a forked child, and stopped by
`RedisStore.close`, or once the store is collected: it holds its mirror
only while it works on it, so a store dropped unclosed takes it along.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import redis

from .keys import origin_hash

__all__ = ["Mirror"]

DEFAULT_HEARTBEAT = 1.0
# However short the store's retry_interval, a listener that lost Redis does not spin.
_MIN_RETRY = 0.05
# A scope that expires is not announced, so its origin stays in the mirror: past
# twice the last snapshot's size (and at least this many), a new snapshot is read.
_MIN_BOUND = 1024


class Mirror:
    """Origins with unhealthy scopes under one prefix, as this process knows them.

    Args:
        pubsub: makes a new subscription object (on one Redis, from the sync
            client's pool; on Redis Cluster, on any node, since a publish
            reaches every node).
        channel: the channel the script publishes on.
        snapshot: reads ``(server clock, {origin hash: sequence})`` from Redis:
            the origins with unhealthy scopes.
        retry_interval: how long to wait before subscribing again after a loss.
        heartbeat: how often an idle subscription is pinged; a ping unanswered
            for as long counts as a lost subscription.
    """

    def __init__(
        self,
        pubsub: Callable[[], Any],
        channel: str,
        snapshot: Any,
        *,
        retry_interval: float,
        heartbeat: float = DEFAULT_HEARTBEAT,
    ) -> None:
        self.live = False  # read on the healthy path without a lock: a plain flag
        # The latest step of any origin's sequence this mirror knows (they all follow
        # the servers' clocks): what a ticket admitted without a round trip carries.
        self.seq = 0
        self._sick: dict[str, int] = {}  # origin hash: the step it was last seen unhealthy at
        self._bound = _MIN_BOUND  # past this many origins, read a new snapshot
        self._pubsub = pubsub
        self._channel = channel
        self._snapshot = snapshot
        self._retry_interval = retry_interval
        self._heartbeat = heartbeat
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self.losses = 0  # subscriptions found lost (a test's and an operator's view)
        _mirrors.add(self)

    def __repr__(self) -> str:
        return f"Mirror(live={self.live}, unhealthy={len(self._sick)})"

    # -- the healthy path --------------------------------------------------------------------

    def healthy(self, origin: str) -> bool:
        """May a request to `origin` be admitted without asking Redis?"""
        if self._thread is None:
            self.start()
            return False
        return self.live and origin_hash(origin) not in self._sick

    # -- what replies tell -----------------------------------------------------------------------

    def saw(self, origin: str, unhealthy: bool, seq: int) -> None:
        """A reply showed `origin` (un)healthy at step `seq` of its sequence. Unhealthy
        counts at once; healthy only from a reply no older than the origin's news."""
        oh = origin_hash(origin)
        with self._lock:
            if unhealthy:
                self._sick[oh] = max(seq, self._sick.get(oh, 0))
            elif seq >= self._sick.get(oh, seq):
                self._sick.pop(oh, None)
            # A ticket admitted without a round trip from now on is no older than this
            # news (what makes a scope forgotten before it stale: see the script's `current`).
            self.seq = max(self.seq, seq)

    # -- the listener -----------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if self._thread is not None and self._pid == os.getpid():
                return
            # Each listener has its own stop: one still winding down after `stop`
            # never resumes because a new one started.
            self._stop = threading.Event()
            self._pid = os.getpid()
            self._thread = threading.Thread(
                target=_listen,
                args=(weakref.ref(self), self._stop),
                name="sidestep-redis-mirror",
                daemon=True,
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop the listener (the next admission starts it again)."""
        with self._lock:
            self._stop.set()
            thread, self._thread = self._thread, None
            self.live = False
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._heartbeat + 1.0)

    def _subscribed(self, stop: threading.Event, clock: Any, origins: Any) -> None:
        """A snapshot read on a confirmed subscription: the mirror is live."""
        with self._lock:
            if stop.is_set():
                return
            self._sick = dict(origins)
            self._bound = max(_MIN_BOUND, 2 * len(self._sick))
            self.seq = max([int(clock), *self._sick.values()])
            self.live = True

    def _lost(self, stop: threading.Event) -> None:
        """The listener's subscription is gone: not live until the next snapshot."""
        with self._lock:
            if not stop.is_set():  # once stopped, the mirror is the next listener's
                if self.live:
                    self.losses += 1
                self.live = False

    def _apply(self, data: str) -> bool:
        """Apply one piece of news; True when the mirror outgrew its bound."""
        oh, unhealthy, seq_text = data.split(" ")
        seq = int(seq_text)
        with self._lock:
            if unhealthy == "1":
                self._sick[oh] = max(seq, self._sick.get(oh, 0))
            elif seq > self._sick.get(oh, seq):  # not older than what the snapshot or a reply said
                self._sick.pop(oh, None)
            self.seq = max(self.seq, seq)
            return len(self._sick) > self._bound

    def forked(self) -> None:
        """In a forked child the parent's listener does not exist: start afresh on demand."""
        self._thread = None
        self.live = False
        self._lock = threading.Lock()


# The listener holds its mirror only while it works on it, never while it waits: a
# store dropped without `close` is collected, and its listener ends with it.


def _listen(ref: weakref.ref[Mirror], stop: threading.Event) -> None:
    """Subscribe, follow, and after a loss subscribe again, until stopped or the mirror is gone."""
    while not stop.is_set():
        mirror = ref()
        if mirror is None:
            return
        pause = _MIN_RETRY
        pubsub = None
        with contextlib.suppress(Exception):  # no node to subscribe on: try again later
            pubsub = mirror._pubsub()
        del mirror  # (its factory may hold the store: nothing of it is kept while waiting)
        try:
            # Whatever broke it, the subscription is lost: subscribe again after
            # the interval, with a new snapshot.
            if pubsub is not None:
                with contextlib.suppress(Exception):
                    _follow(ref, pubsub, stop)
        finally:
            mirror = ref()
            if mirror is not None:
                mirror._lost(stop)
                # the interval as it is at the loss (it was read when this try began)
                pause = max(mirror._retry_interval, _MIN_RETRY)
            del mirror
            if pubsub is not None:
                with contextlib.suppress(Exception):
                    pubsub.close()
        stop.wait(pause)


def _follow(ref: weakref.ref[Mirror], pubsub: Any, stop: threading.Event) -> None:
    """Subscribe, read the snapshot, then apply the news until the subscription is lost."""
    mirror = ref()
    if mirror is None:
        return
    heartbeat = mirror._heartbeat
    pubsub.subscribe(mirror._channel)
    del mirror
    deadline = time.monotonic() + heartbeat
    while True:  # the subscription is confirmed before the snapshot is read
        message = pubsub.get_message(timeout=heartbeat)
        if message is not None and message["type"] == "subscribe":
            break
        if time.monotonic() > deadline:
            raise redis.TimeoutError("no subscription")
    mirror = ref()
    if mirror is None:
        return
    mirror._subscribed(stop, *mirror._snapshot())
    del mirror
    pinged = answered = time.monotonic()
    while not stop.is_set():
        message = pubsub.get_message(timeout=heartbeat / 4)
        now = time.monotonic()
        if message is not None:
            answered = now
            if message["type"] == "message":
                mirror = ref()
                if mirror is None:
                    return
                if mirror._apply(message["data"]):  # still subscribed: news keeps its order
                    mirror._subscribed(stop, *mirror._snapshot())
                del mirror
        elif ref() is None:
            return
        if now - answered > heartbeat:
            if pinged <= answered:
                pubsub.ping()
                pinged = now
            elif now - pinged > heartbeat:
                raise redis.TimeoutError("the subscription stopped answering")


_mirrors: weakref.WeakSet[Mirror] = weakref.WeakSet()


def _after_fork() -> None:
    for mirror in list(_mirrors):
        mirror.forked()


if hasattr(os, "register_at_fork"):  # POSIX only: elsewhere nothing forks
    os.register_at_fork(after_in_child=_after_fork)
