"""How a request ends: the answer handed over, or every candidate suspended.

The response with its attribution (and, from a rewritten target, in the
client's terms); the last failure; or `AllCandidatesSuspended` (or its 503),
logged once per episode.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from .._common.errors import AllCandidatesSuspended, CandidateStatus
from ..logging import emit
from .reverse import client_view, may_change
from .routes import CompiledTarget
from .run import CoreState, Run, skip_status
from .suspended import unavailable_body, unavailable_headers

__all__ = ["Endings"]

_QUIET_LIMIT = 1024  # routes whose all-suspended episode is remembered, to log it once


def _same_episode(seen: tuple[Any, ...] | None, episode: tuple[Any, ...]) -> bool:
    if seen is None or len(seen) != len(episode):
        return False
    for (*was, was_until), (*now, until) in zip(seen, episode, strict=True):
        if was != now or (was_until is None) != (until is None):
            return False
        if until is not None and abs(until - was_until) > 1.0:
            return False
    return True


class Endings(CoreState):
    """How a request ends: the answer handed over, or every candidate suspended."""

    def _attribute(self, response: Any, run: Run, target: CompiledTarget, index: int) -> Any:
        cands = run.cands
        if (index or not cands.direct) and may_change(response.headers):
            # a rewritten target: its answer in the client's terms
            raw = client_view(response.headers.raw, target, run.request.url, cands)
            if raw is not None:
                response.headers = type(response.headers)(raw)
        about = cands.about[index].copy()  # route, target, failover: as on a first attempt
        if run.attempts != 1:
            about["attempts"] = run.attempts
        if run.excluded:  # left out: the request names state its own target's provider keeps
            about["excluded"] = [t.name for t in run.excluded]
        if run.hedged:  # a second attempt was sent beside the first (`hedged`)
            about["hedged"] = True
        response.extensions["sidestep"] = about
        return response

    def _final(self, result: Any, run: Run, target: CompiledTarget, index: int) -> Any:
        if isinstance(result, BaseException):
            raise result
        return self._attribute(result, run, target, index)

    def _all_suspended(self, run: Run) -> Any:
        skipped = [skip_status(*skip) for skip in run.skipped]
        error = AllCandidatesSuspended(tuple(s for s, _ in skipped), route=run.route_name)
        emit(
            "all_candidates_suspended",
            self._episode(run, skipped),
            route=run.route_name,
            targets=[s.target for s, _ in skipped],
            retry_in_s=error.retry_after,
        )
        if run.policy.on_all_suspended == "raise":
            raise error
        headers = unavailable_headers(error)
        if error.retry_after is not None:
            headers.append(("retry-after-ms", str(math.ceil(error.retry_after * 1000))))
        headers += [("x-sidestep", "all_candidates_suspended"), ("x-should-retry", "false")]
        about: dict[str, Any] = {
            "route": run.route_name,
            "target": None,
            "attempts": 0,
            "failover": False,
        }
        if run.excluded:
            about["excluded"] = [t.name for t in run.excluded]
        return self.flavour.Response(
            503,
            headers=headers,
            content=unavailable_body(error),
            request=run.request,
            extensions={"sidestep": about},
        )

    def _episode(self, run: Run, skipped: list[tuple[CandidateStatus, float | None]]) -> int | None:
        """The level to log an all-suspended request at: WARNING once per episode.

        An episode is one set of refusals (which targets, in which state and
        for what reason, until when, give or take a second for stores that
        answer in relative time); it changes only with a transition, so an
        outage logs as many warnings as it has transitions, whatever the
        traffic. Repeats are DEBUG (None: the event's own level).
        """
        episode = tuple((s.target, s.state, s.reason, until) for s, until in skipped)
        key = run.route_name if run.cands.route else run.cands.origin
        if _same_episode(self._quiet.get(key), episode):
            return logging.DEBUG
        if len(self._quiet) >= _QUIET_LIMIT:
            self._quiet.clear()
        self._quiet[key] = episode
        return None
