"""The soak's "memory flat" check (chaos.scenarios.rss_growth_checks)."""

from __future__ import annotations

from chaos.scenarios import RSS_GROWTH_FLOOR_KIB, rss_growth_checks


def _samples(series: dict[str, list[int | None]]) -> list[tuple[float, dict[str, int | None]]]:
    n = len(next(iter(series.values())))
    return [(10.0 * i, {k: v[i] for k, v in series.items()}) for i in range(n)]


def test_warm_up_growth_is_not_judged_and_flat_passes() -> None:
    # 0..30 s is warm-up for a 120 s load; the job service fills its caches there
    assert (
        rss_growth_checks(
            _samples({"job_service": [100_000, 115_000, 120_000, 121_000] + [122_000] * 9})
        )
        == []
    )


def test_steady_growth_after_warm_up_fails() -> None:
    # ~3 MB a minute, as the job service did while every retry compiled a statement
    growing = [100_000 + 3_000 * i for i in range(13)]  # +3 MB every sample
    failed = rss_growth_checks(_samples({"job_service": growing, "standin": [40_000] * 13}))
    assert len(failed) == 1 and failed[0].startswith("job_service RSS grew")


def test_allowance_is_the_larger_of_a_floor_and_a_share() -> None:
    small = [50_000] * 4 + [50_000 + RSS_GROWTH_FLOOR_KIB] * 9  # exactly the floor: ok
    big = [200_000] * 4 + [200_000 + 20_000] * 9  # 10 % of 200 MB = 20,000 KiB: ok
    over = [200_000] * 4 + [200_000 + 20_001] * 9
    assert rss_growth_checks(_samples({"a": small, "b": big})) == []
    assert len(rss_growth_checks(_samples({"b": over}))) == 1


def test_a_service_not_running_is_not_judged() -> None:
    assert rss_growth_checks(_samples({"w": [70_000] * 4 + [None] * 9})) == []
    assert rss_growth_checks([(0.0, {"w": 1})]) == []
