"""Without httpx2 installed: sidestep imports, wraps and installs for httpx alone, and says which extra to add."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

# Run in a fresh interpreter where `import httpx2` fails as it does when httpx2 is not installed.
PRELUDE = "import sys; sys.modules['httpx2'] = None\n"


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603  # this interpreter, our own code
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ,
        check=False,
    )


def test_sidestep_works_for_httpx_without_httpx2() -> None:
    """wrap(), install() and AllCandidatesSuspended work for httpx without httpx2, which is never imported."""
    done = run(
        """
        import httpx, sidestep
        client = sidestep.wrap(httpx.AsyncClient())
        assert isinstance(client._transport, sidestep.AsyncFailoverTransport)
        sidestep.install()
        assert isinstance(httpx.Client()._transport, sidestep.FailoverTransport)
        sidestep.uninstall()
        assert issubclass(sidestep.AllCandidatesSuspended, httpx.TransportError)
        assert sys.modules["httpx2"] is None
        print("ok")
        """
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_sidestep_httpx2_without_httpx2_names_the_extra() -> None:
    """Importing sidestep.httpx2 without httpx2 raises an ImportError that names the httpx2 extra."""
    done = run(
        """
        try:
            import sidestep.httpx2
        except ImportError as exc:
            print(exc.name, "|", exc)
        """
    )
    assert done.stdout.strip() == (
        "httpx2 | sidestep.httpx2 needs httpx2: pip install 'sidestep[httpx2]'"
    ), done.stderr
