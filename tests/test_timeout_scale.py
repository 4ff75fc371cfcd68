"""``$MODBRIDGE_TIMEOUT_SCALE``: the answer timeouts for slow links and loaded machines
(modbridge.link.requests). Never below SPEC 10's minimum, garbage ignored."""

from __future__ import annotations

import pytest

from modbridge.link import requests as R


@pytest.mark.parametrize(
    "raw,want",
    [
        (None, 1.0), ("", 1.0), ("1", 1.0), ("2.5", 2.5), ("60", 60.0),
        ("0.5", 1.0), ("0", 1.0), ("-3", 1.0), ("61", 1.0), ("nan", 1.0), ("inf", 1.0),
        ("fast", 1.0), ("4x", 1.0), ("\x1b[2J", 1.0),
    ],
)  # fmt: skip
def test_the_scale_is_bounded_and_garbage_is_ignored(raw, want):
    env = {} if raw is None else {R.TIMEOUT_SCALE_ENV: raw}
    assert R.timeout_scale(env) == want


def test_the_defaults_carry_the_scale_of_this_process():
    scale = R.timeout_scale()
    assert R.REQUEST_TIMEOUT_S == pytest.approx(1.0 * scale)
    assert R.REQUEST_TIMEOUTS["config_save"] == pytest.approx(3.0 * scale)
    assert R.REQUEST_TIMEOUTS["selftest"] == pytest.approx(75.0 * scale)


def test_the_control_socket_allows_the_scaled_selftest():
    """A bridge under the same scale takes the client's scaled selftest timeout (on
    a11cf12 a scale of 4 made `selftest` through the bridge a bad_request: 300 > 120)."""
    from modbridge.ops import ctlsock

    assert ctlsock.MAX_TIMEOUT_S == pytest.approx(120.0 * R.timeout_scale())
    assert R.REQUEST_TIMEOUTS["selftest"] < ctlsock.MAX_TIMEOUT_S


def test_the_virtual_modules_repl_start_carries_the_scale():
    """The sim's REPL interpreter start (10 s): a full run beside qemu jobs took longer
    and a test saw "the REPL's interpreter did not start" (issue 24's round, 8419fd5)."""
    from modbridge.sim import repl

    assert repl.START_TIMEOUT_S == pytest.approx(10.0 * R.timeout_scale())


def test_the_virtual_mcus_hang_timeout_carries_the_scale():
    """A firmware process with no request for this long is taken as hung (10 s): a
    fresh-clone run beside a qemu stress job halted a healthy wheel-installed virtual
    module that way (its configuring modules compiled from source)."""
    from modbridge.sim import runner

    assert runner.HANG_TIMEOUT_S == pytest.approx(10.0 * R.timeout_scale())
