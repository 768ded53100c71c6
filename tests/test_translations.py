"""The Chinese edition's catalogs (scripts/translations.py): in step with the English text, and every
translation carries its English's glued numbers, references, terms' targets, code and math, and types no
measured number by hand (none that its English does not write)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from babel.messages.pofile import read_po

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
import translations  # noqa: E402
from test_evidence import measured_numbers  # noqa: E402

CATALOGS = sorted(translations.CATALOGS.rglob("*.po"))


def _messages(path: Path) -> list:
    return [m for m in read_po(path.open("rb"), locale=translations.LANGUAGE) if m.id]


def test_the_catalogs_hold_exactly_the_english_pages_messages(tmp_path):
    templates = translations.extract(tmp_path)
    pages = {p.relative_to(translations.CATALOGS).with_suffix("").as_posix() for p in CATALOGS}
    assert pages == set(templates), "pages and catalogs differ: run make translations"
    for page, template in templates.items():
        english = {m.id for m in template if m.id}
        catalog = {m.id for m in _messages(translations.CATALOGS / f"{page}.po")}
        assert catalog == english, (
            f"{page}: the English changed and its catalog was not refreshed (run make translations): "
            f"{len(english - catalog)} new, {len(catalog - english)} gone, e.g. {sorted(english ^ catalog)[:2]}"
        )


def test_the_markup_rule_finds_a_lost_glue_a_changed_target_and_spares_shown_words():
    english = "a {term}`query <Query>` took {glue:text}`gap:.2f` s, `x`, $a_1$ {cite:p}`v2017` ({ref}`the table <t>`)"
    good = "一个{term}`查询 <Query>`，{cite:p}`v2017` 用了 {glue:text}`gap:.2f` 秒，`x`，$a_1$（{ref}`该表 <t>`）"
    assert translations.kept_markup(english) == translations.kept_markup(good)
    for bad in (good.replace("{glue:text}`gap:.2f`", "0.07"), good.replace("<Query>", "<查询>"),
                good.replace("$a_1$", "$a_2$"), good.replace("`x`", "x"), good.replace("<t>", "<u>")):  # fmt: skip
        assert translations.kept_markup(english) != translations.kept_markup(bad), bad


def test_a_translated_glue_reads_its_page(tmp_path):
    assert translations.glue_by_page("慢 {glue:text}`ratio:.0f` 倍，{glue}`n`", "01_attention.ipynb") == (
        "慢 {glue:text}`01_attention.ipynb::ratio:.0f` 倍，{glue}`01_attention.ipynb::n:s`"
    )


@pytest.mark.parametrize("path", CATALOGS, ids=lambda p: p.stem)
def test_every_translation_keeps_its_markup_and_types_no_measured_number(path):
    faults = {
        m.id[:50]: sorted(set(translations.kept_markup(m.id)) ^ set(translations.kept_markup(m.string)))
        for m in _messages(path)
        if m.string and translations.kept_markup(m.id) != translations.kept_markup(m.string)
    }
    assert not faults, f"{path.stem}: translations that lost or changed their English's markup: {faults}"
    typed = {  # a number the English does not write (a version, "Exercise 3.2" carry over)
        m.id[:50]: extra
        for m in _messages(path)
        if m.string and (extra := set(measured_numbers(m.string)) - set(measured_numbers(m.id)))
    }
    assert not typed, f"{path.stem}: measured numbers typed into translations (glue them as the English does): {typed}"


@pytest.mark.parametrize("path", CATALOGS, ids=lambda p: p.stem)
def test_every_entry_is_translated_and_reviewed(path):
    todo = [m.id[:60] for m in _messages(path) if not m.string or m.fuzzy]
    assert not todo, (
        f"{path.stem}: {len(todo)} entries untranslated or fuzzy (changed English: review the translation and "
        f"drop its fuzzy flag), e.g. {todo[:3]}"
    )


def test_a_numbered_title_is_not_read_as_a_list():
    assert translations.numbered_title("1. 注意力") == "1\\. 注意力"  # else the page keeps its English title
    assert translations.numbered_title("第 1. 章") == "第 1. 章"
