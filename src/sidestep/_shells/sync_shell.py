"""The sync shell: drives the core's steps in the caller's thread, performing each
effect they yield — send, read a body's head, close, wait to retry, call the store —
and handing back the result or the exception. It decides nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator
from typing import Any

from .._core.effects import Call, Close, Race, Read, Send, Sleep
from .._core.run import Run
from .deadlines import NO_ANSWER, OUT_OF_TIME
from .races import BranchCancelled, Lost, race_sync, stops_at
from .replay import sync_replay
from .shell import SENDING, Shell

__all__ = ["SyncShell"]


class SyncShell(Shell):
    _exact = False

    def _default_transport(self) -> Any:
        return self._flavour.module.HTTPTransport()

    def handle_request(self, request: Any) -> Any:
        sending = SENDING.get()
        if not self.active or (sending is not None and self._sent_further_out(request, sending)):
            return self.inner.handle_request(request)  # (under no fault plan)
        core = self._core
        ready = core.decide(request)
        if isinstance(ready, Run):  # not ready: the general path goes on from the decision
            return self._drive(core.handle(request, ready))
        try:  # the fast path: the core decided, this sends, the core settles
            if self._forwards:
                response = self._send(ready[0])
            else:
                response = self._inner.handle_request(ready[0])
        except BaseException as exc:  # the core decides what every failure means
            return self._drive(core.resume(ready, exc))
        answer = core.settle(ready, response)
        return self._drive(core.resume(ready, response)) if answer is None else answer

    def _send(self, request: Any) -> Any:
        token = SENDING.set((request, self._core.config))
        try:
            return self._inner.handle_request(request)
        finally:
            SENDING.reset(token)

    def close(self) -> None:
        self._closing()
        self._inner.close()

    # A client used as a context manager enters and exits its transports: the
    # inner one gets exactly those calls, as it would with no sidestep between.
    def __enter__(self) -> Any:
        self._inner.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._closing()
        self._inner.__exit__(*exc_info)

    def _closing(self) -> None:
        """Tell the core, and wake the requests waiting to retry (they send nothing more)."""
        with self._waits:
            self._core.closing()
            self._waits.notify_all()

    def _drive(self, steps: Generator[Any, Any, Any], lost: Lost | None = None) -> Any:
        """Perform the effects `steps` yields, to its end. A branch of a race (`races`)
        comes with its `lost`: once set, it sends, reads and waits no more, and
        `BranchCancelled` is thrown into it instead, so it closes what it holds (a read
        it cut short, or any effect that failed once it lost, is that cancellation too:
        not the upstream's failure)."""
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                effect = steps.send(value) if error is None else steps.throw(error)
            except StopIteration as stop:
                return stop.value
            value, error = None, None
            if lost is not None and lost.is_set() and stops_at(effect):
                error = BranchCancelled()
                continue
            try:
                if type(effect) is Send:  # the common effect, inline
                    if self._forwards:
                        value = self._send(effect.request)
                    else:
                        value = self._inner.handle_request(effect.request)
                elif lost is not None and type(effect) is Read:
                    value = self._read(effect, lost)
                else:
                    value = self._perform(effect)
            except BaseException as exc:  # the core decides what every failure means
                error = exc
            if lost is not None and lost.is_set() and stops_at(effect):
                # lost while it was performed: what it brought (a failure, an answer) is not
                # judged, as the cancellation it is; an answer its send returned is closed
                if error is None and type(effect) is Send:
                    with contextlib.suppress(Exception):
                        value.close()
                value, error = None, BranchCancelled()

    def _perform(self, effect: Any) -> Any:
        kind = type(effect)  # Send is performed inline by _drive
        if kind is Read:
            return self._read(effect)
        if kind is Close:
            return effect.response.close()
        if kind is Sleep:
            core = self._core
            with self._waits:  # woken by a close (`_closing`), or one since `effect.closes`
                self._waits.wait_for(lambda: core.closes != effect.closes, effect.seconds)
            return None
        if kind is Call:
            return getattr(self._core.store, effect.name)(*effect.args)
        if kind is Race:
            return race_sync(effect, self._drive)
        raise TypeError(f"unknown effect {kind.__name__}")

    def _read(self, effect: Read, lost: Lost | None = None) -> tuple[list[bytes], bool]:
        response = effect.response
        stream = response.stream
        chunks = iter(stream)
        head: list[bytes] = []
        size = 0
        scan = effect.scan
        # deadlines: the core's, held against its clock as each chunk comes in (a read
        # itself is bounded by the read timeout the core set)
        clock, deadline, end_by = self._core.clock, effect.deadline, effect.end_by
        # a branch of a race: its loss wakes this read (`Lost`), until the stream is done
        aborting = contextlib.nullcontext() if lost is None else lost.aborting(response)
        try:
            with aborting:
                while size < effect.limit:
                    chunk = next(chunks)
                    if lost is not None and lost.is_set():
                        raise BranchCancelled  # (an answer whose socket could not be shut)
                    if deadline is not None and clock() > deadline:
                        raise self._flavour.read_timeout(NO_ANSWER, request=effect.request)
                    head.append(chunk)
                    size += len(chunk)
                    if scan is not None and scan.feed(chunk):
                        break  # scan: the head ends where the core's reader says
        except StopIteration:
            stream.close()
            response.stream = self._flavour.ByteStream(b"".join(head))
            return head, True
        except BaseException:
            # The head failed between two chunks (the scan found a limit passed while
            # keep-alives came): the iterator started here waits at a yield. Finish it
            # now (a generator's finally runs), rather than leave it to the garbage
            # collector.
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
            raise
        on_error, drive = effect.on_error, self._drive
        # The body's verdict is due once: at its end, at its failure, or when the
        # caller closes it early (a stream left at "[DONE]" was a success).
        end = [effect.on_end] if effect.on_end is not None else []

        def finish() -> None:
            if end:
                drive(end.pop()())

        def rest() -> Iterator[bytes]:
            yield from head
            try:
                if scan is None and end_by is None:
                    yield from chunks
                else:
                    for chunk in chunks:
                        if end_by is not None and clock() > end_by:  # (deadlines, as above)
                            raise self._flavour.read_timeout(OUT_OF_TIME, request=effect.request)
                        if scan is not None:  # scan: every later chunk fed to the reader too
                            scan.feed(chunk)
                        yield chunk
            except Exception as exc:
                end.clear()
                if on_error is not None:
                    drive(on_error(exc))
                raise
            finish()

        response.stream = sync_replay(self._flavour)(rest(), stream, finish)
        return head, False
