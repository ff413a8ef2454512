"""`shielded`: work that finishes whatever cancels its caller, under asyncio and trio.

anyio's shielded scope does not hold back asyncio's own cancellations; these tests
cancel the caller in each way there is while the work waits, and check the work
finished and the caller's cancellation came out afterwards.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from sidestep._common.shield import shielded


class Work:
    """Work that waits until the test lets it go, and says whether it finished."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.go = asyncio.Event()
        self.finished = False

    async def __call__(self, value: str) -> str:
        self.started.set()
        await self.go.wait()
        await asyncio.sleep(0)  # a checkpoint after the wait, where a cancel would land
        self.finished = True
        return value


def test_asyncios_own_cancel_landing_again_and_again_waits_for_the_work() -> None:
    """Three `Task.cancel()`s while the work waits: the work still finishes, and only then
    does the caller's cancellation come out."""

    async def main() -> None:
        work = Work()
        caller = asyncio.ensure_future(shielded(work, "v", limit=None, otherwise=None))
        await work.started.wait()
        for _ in range(3):
            caller.cancel()
            await asyncio.sleep(0.01)
            assert not caller.done()  # still waiting for the work
        work.go.set()
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert work.finished

    asyncio.run(main())


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout is built in from 3.11")
def test_an_asyncio_timeout_ending_meanwhile_still_raises_timeout_once_the_work_is_done() -> None:
    """`asyncio.timeout` around the caller expires while the work waits: the work finishes
    and the caller gets the `TimeoutError` that timeout gives."""

    async def main() -> None:
        work = Work()

        async def caller() -> None:
            async with asyncio.timeout(0.05):  # type: ignore[attr-defined]
                await shielded(work, "v", limit=None, otherwise=None)

        task = asyncio.ensure_future(caller())
        await work.started.wait()
        await asyncio.sleep(0.2)  # the timeout has fired
        assert not task.done()
        work.go.set()
        with pytest.raises(TimeoutError):
            await task
        assert work.finished

    asyncio.run(main())


def test_an_anyio_cancel_scope_waits_for_the_work_without_spinning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An anyio scope cancelled around the caller (anyio cancels its tasks again at every
    turn of the loop): the work finishes, the scope then ends the caller at its next
    checkpoint, and the caller waited once, not once per turn of the loop."""
    waits = []
    wait = asyncio.wait

    def counted(awaitables: Any) -> Any:
        waits.append(awaitables)
        return wait(awaitables)

    monkeypatch.setattr(asyncio, "wait", counted)

    async def main() -> None:
        work = Work()
        with anyio.CancelScope() as scope:
            asyncio.get_running_loop().call_later(0.01, scope.cancel)
            asyncio.get_running_loop().call_later(0.2, work.go.set)
            assert await shielded(work, "v", limit=None, otherwise=None) == "v"
            await anyio.lowlevel.checkpoint()
        assert scope.cancelled_caught and work.finished
        assert len(waits) == 1

    asyncio.run(main())


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_work_past_its_limit_gives_the_stand_in(backend: str) -> None:
    """Work that takes longer than `limit` is given up: `otherwise` comes back."""

    async def slow() -> str:
        await anyio.sleep(10)
        return "late"

    async def main() -> object:
        return await shielded(slow, limit=0.05, otherwise="stand-in")

    assert anyio.run(main, backend=backend) == "stand-in"


def test_a_trio_cancel_scope_waits_for_the_work() -> None:
    """Under trio, a cancelled scope around the caller waits for the work to finish, and
    ends the caller at its next checkpoint."""
    finished = []

    async def work() -> None:
        await anyio.sleep(0.1)
        finished.append(True)

    async def main() -> None:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await shielded(work, limit=None, otherwise=None)
            await anyio.lowlevel.checkpoint()  # where trio delivers the cancellation
        assert scope.cancelled_caught

    anyio.run(main, backend="trio")
    assert finished == [True]


def test_a_cancelled_caller_gets_its_cancellation_even_when_the_work_failed() -> None:
    """The work fails after the caller was cancelled: the caller's cancellation comes out
    (not the work's error), and the work's error is taken, so the loop reports nothing."""
    reported: list[object] = []

    async def failing() -> None:
        await asyncio.sleep(0.05)
        raise ValueError("the work's own")

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: reported.append(ctx))
        caller = asyncio.ensure_future(shielded(failing, limit=None, otherwise=None))
        await asyncio.sleep(0.01)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller

    asyncio.run(main())
    import gc

    gc.collect()
    assert reported == []
