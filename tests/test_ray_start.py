"""Starting the embedded Ray. Run: pytest tests/test_ray_start.py"""
from __future__ import annotations

import pytest

from study.runner import init_ray


def test_embedded_ray_start_that_times_out_is_tried_again(monkeypatch, capsys):
    """A raylet that misses Ray's 30 s registration window (a crowded box) costs a retry, not the sweep."""
    import ray

    assert not ray.is_initialized(), "an earlier test left its Ray running"
    real_init, calls = ray.init, []

    def flaky_init(*a, **kw):  # the first start fails the way Ray reports it; the second is real
        calls.append(kw)
        if len(calls) == 1:
            raise Exception("The current node timed out during startup. This could happen because ...")
        return real_init(*a, **kw)

    monkeypatch.setattr(ray, "init", flaky_init)
    r, started = init_ray(None, num_cpus=1)
    try:
        assert started and r.is_initialized() and len(calls) == 2
        assert "timed out during startup (attempt 1/3)" in capsys.readouterr().err
    finally:
        r.shutdown()
    # any other start error is not retried
    calls.clear()
    monkeypatch.setattr(ray, "init", lambda *a, **kw: calls.append(kw) or (_ for _ in ()).throw(ValueError("bad")))
    with pytest.raises(ValueError):
        init_ray(None, num_cpus=1)
    assert len(calls) == 1
