"""Signal handling of the draining server and the app's shutdown, without a model."""

from __future__ import annotations

import signal
import threading
import time

import pytest
import uvicorn
from fastapi.testclient import TestClient

from tt_serve.server import drain as drain_module
from tt_serve.server import run
from tt_serve.server.app import ServerState, create_app
from tt_serve.server.drain import Drain, DrainingServer


def test_second_signal_cuts_in_flight_requests_short_third_exits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drain, reasons = Drain(), []
    server = DrainingServer(uvicorn.Config(app=None), drain, bound_s=30, cut_short=reasons.append)
    drain.in_flight = 2
    server.handle_exit(signal.SIGTERM, None)
    assert drain.draining and not server.should_exit and reasons == []
    server.handle_exit(signal.SIGTERM, None)  # exits now, and says why to the requests it ends
    assert server.should_exit and len(reasons) == 1 and "SIGTERM" in reasons[0]

    def exit_now(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(drain_module.os, "_exit", exit_now)
    with pytest.raises(SystemExit):
        server.handle_exit(signal.SIGINT, None)


class FakeEngine:
    def __init__(self) -> None:
        self.shut_down = False

    def shutdown(self) -> None:
        self.shut_down = True


def test_stop_during_load_waits_for_it_and_shuts_its_engine_down() -> None:
    """The engine a load finishes after the stop is shut down, not left to die with the
    process (its loop thread and backend still running)."""
    state, engine, loaded = ServerState(model_name="m"), FakeEngine(), threading.Event()

    def loader(st: ServerState) -> None:
        time.sleep(0.5)
        st.engine = engine  # type: ignore[assignment]
        loaded.set()

    with TestClient(create_app(state, loader)) as c:
        assert c.get("/health").status_code == 503
    assert loaded.is_set() and engine.shut_down


def test_ctrl_c_while_starting_is_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(argv: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "_serve", interrupted)
    assert run.serve_main([]) == 130
    assert "interrupted" in capsys.readouterr().err
