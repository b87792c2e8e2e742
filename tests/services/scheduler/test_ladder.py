"""The providers file: the example in deploy/ reads, rungs go by priority, a mistake is refused
naming the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.scheduler.ladder import (
    LOCAL_ONLY,
    Ladder,
    LadderError,
    ProviderSpec,
    check_reachable,
    load_ladder,
)

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "providers.yaml"


def test_the_example_reads_and_no_file_means_the_local_provider_alone() -> None:
    assert [p.name for p in load_ladder(EXAMPLE).ordered()] == ["local"]
    assert load_ladder(None) == LOCAL_ONLY


def test_rungs_go_by_priority_then_as_listed(tmp_path: Path) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(
        "providers:\n"
        "  - {name: cloud, kind: local, priority: 2}\n"
        "  - {name: own, kind: local, priority: 0}\n"
        "  - {name: spare, kind: local, priority: 2}\n"
    )
    assert [p.name for p in load_ladder(path).ordered()] == ["own", "cloud", "spare"]


@pytest.mark.parametrize(
    ("document", "named"),
    [
        ("providers:\n  - {name: a, kind: local, capasity: 2}\n", "providers.0.capasity"),
        ("providers:\n  - {name: a, kind: cloud}\n", "providers.0.kind"),
        ("providers:\n  - {name: a, kind: kubernetes}\n", "kubernetes"),
        ("providers:\n  - {name: a, kind: local}\n  - {name: a, kind: local}\n", "unique"),
        ("providers: []\n", "providers"),
        ("providers: [\n", "providers.yaml"),
    ],
)
def test_a_mistake_is_refused_naming_the_file_and_the_field(
    tmp_path: Path, document: str, named: str
) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(document)
    with pytest.raises(LadderError) as refused:
        load_ladder(path)
    assert str(refused.value).startswith(str(path))
    assert named in str(refused.value)


def test_remote_rungs_need_a_url_to_report_to_and_local_ones_use_the_schedulers_own() -> None:
    local = ProviderSpec(name="own", kind="local")
    remote = ProviderSpec(name="cloud", kind="skypilot")
    ladder = Ladder(providers=[local, remote])
    with pytest.raises(LadderError, match=r"providers\[1\]\.report_url: the skypilot rung 'cloud'"):
        check_reachable(ladder, public_url=None)
    check_reachable(ladder, public_url="https://tuneloop.example.com")
    own = "http://127.0.0.1:8003"
    assert local.reports_base("https://tuneloop.example.com", own) == own
    assert (
        remote.reports_base("https://tuneloop.example.com/", own) == "https://tuneloop.example.com"
    )
    pinned = remote.model_copy(update={"report_url": "http://10.0.0.5:8003"})
    check_reachable(Ladder(providers=[pinned]), public_url=None)
    assert pinned.reports_base("https://tuneloop.example.com", own) == "http://10.0.0.5:8003"
