"""Docs stay true to the code: every hook and every vocabulary pattern is documented."""

from pathlib import Path

from quantweave.hookspecs import QuantweaveHookSpecs
from quantweave.vocabulary import PATTERNS

DOC = (Path(__file__).resolve().parents[1] / "docs" / "plugins.md").read_text()


def test_every_hook_is_documented_with_the_version_that_added_it():
    hooks = [name for name in vars(QuantweaveHookSpecs) if name.startswith("quantweave_")]
    assert hooks
    for hook in hooks:
        section = DOC.split(f"### `{hook}`", 1)
        assert len(section) == 2, f"docs/plugins.md has no section for hook {hook}"
        assert "Added in plugin API" in section[1].split("###", 1)[0]


def test_every_pattern_of_the_vocabulary_is_documented():
    for name, (description, _ops) in PATTERNS.items():
        assert f"| `{name}` | {description} |" in DOC, name


def test_the_plugin_api_table_matches_the_releases_the_core_records():
    from quantweave.plugin_api import PLUGIN_API_RELEASES

    table = DOC.split("| plugin API | first release | added |", 1)[1].split("\n\n", 1)[0]
    rows = [line.split("|")[1:3] for line in table.strip().splitlines()[1:]]
    assert {int(api): release.strip() for api, release in rows} == {
        api: release for api, (release, _) in PLUGIN_API_RELEASES.items()
    }
