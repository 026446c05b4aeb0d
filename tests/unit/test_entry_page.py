"""The main job's entry page (jobs/main_job.py): each experiment's report as a
section, the generation demo's card and first questions, one page with the retrieval report."""

import json

from logicrank.jobs.main_job import demo_section, section_of, write_entry_page


def test_the_entry_page_is_made_of_the_reports_as_sections(tmp_path):
    report = tmp_path / "exp" / "report.md"
    report.parent.mkdir()
    report.write_text("# Experiment itlr\n\n# not a title\n", encoding="utf-8")
    assert section_of(report) == "## Experiment itlr\n\n# not a title\n"  # only the title moves down a level

    demo = tmp_path / "generate"
    demo.mkdir()
    (demo / "card.md").write_text("# Generated dataset: generate\n\ncounts\n", encoding="utf-8")
    rows = [{"_id": f"q{i}", "logical_query": f'"a{i}"', "text": f"Q{i}?", "status": "ok"} for i in range(6)]
    (demo / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    text = demo_section(demo)
    assert text.startswith("## Dataset generation demo\n\ncounts\n") and "- `\"a3\"` -> 'Q3?' (ok)" in text and "Q4?" not in text

    (tmp_path / "evaluate").mkdir()
    (tmp_path / "evaluate" / "report.md").write_text("# Retrieval\n![plot](plots/a.png)\n", encoding="utf-8")
    write_entry_page(tmp_path, "itlr", "rules", "lag", "setlogic", text)
    page = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert page.startswith("# Retrieval\n![plot](evaluate/plots/a.png)\n\nitlr\nrules\nlag\nsetlogic\n## Dataset generation demo")
