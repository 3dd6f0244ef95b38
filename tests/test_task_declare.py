"""A field declared once (`skygreen.task.declare`): its reader, its errors, its reference row
and its JSON Schema all come from the one annotation."""

from __future__ import annotations

import subprocess
import sys
from typing import Annotated, ClassVar, Literal

import pytest

from skygreen.errors import SpecError
from skygreen.task.declare import FieldProblem, Record, allowed_text, declared, field_schema, meaning, read_record
from skygreen.task.reference import RECORDS, TASK_FIELDS
from skygreen.task.spec import Batch, EarlyStopConfig, GreenSpec


class Toy(Record, frozen=True, kw_only=True):
    """A section with one field of each kind, as a new field would be declared."""

    SECTION: ClassVar[str] = "skygreen.toy"
    keep: Annotated[int, meaning("How many to keep.", ge=2, le=10)] = 3
    mode: Annotated[Literal["fast", "slow"], meaning("How to go.")] = "fast"
    rate: Annotated[float, meaning("How often.", gt=0, unit="per hour")] | None = None
    name: Annotated[str, meaning("Who.", example="val_loss")]

    def rules(self) -> None:
        if self.mode == "slow" and self.keep > 5:
            raise FieldProblem("keep", "is at most 5 when slow", value=self.keep, hint="keep: 5")


def error(raw: object) -> SpecError:
    with pytest.raises(SpecError) as info:
        read_record(Toy, raw, "skygreen.toy")
    return info.value


def test_the_declaration_reads_a_section_with_its_defaults() -> None:
    toy = read_record(Toy, {"name": "n", "keep": 4, "mode": "SLOW", "rate": 2}, "skygreen.toy")
    assert (toy.keep, toy.mode, toy.rate, toy.name) == (4, "slow", 2.0, "n")
    assert read_record(Toy, {"name": "n"}, "skygreen.toy").keep == 3


@pytest.mark.parametrize(
    "raw, field, words",
    [
        ({"name": "n", "kep": 3}, "skygreen.toy.kep", ["unknown key", "did you mean 'keep'?", "keep, mode, rate"]),
        ({"name": "n", "keep": "two"}, "skygreen.toy.keep", ["expected an integer", "keep: 2"]),
        ({"name": "n", "keep": 1}, "skygreen.toy.keep", ["must be at least 2"]),
        ({"name": "n", "keep": 11}, "skygreen.toy.keep", ["must be at most 10"]),
        ({"name": "n", "mode": "fats"}, "skygreen.toy.mode", ["fast, slow", "did you mean 'fast'?"]),
        ({"name": "n", "rate": 0}, "skygreen.toy.rate", ["greater than 0"]),
        ({"keep": 3}, "skygreen.toy.name", ["is required", "name: val_loss"]),
        ({"name": "n", "mode": "slow", "keep": 8}, "skygreen.toy.keep", ["at most 5 when slow", "fix: keep: 5"]),
        (["keep"], "skygreen.toy", ["expected a mapping"]),
    ],
)
def test_errors_name_the_field_the_value_what_is_allowed_and_a_fix(raw, field, words) -> None:
    err = error(raw)
    assert err.field == field
    for word in words:
        assert word in str(err), str(err)


def test_the_reference_text_and_the_schema_come_from_the_declaration() -> None:
    keep, mode, rate, _ = declared(Toy)
    assert allowed_text(keep) == "2 to 10" and allowed_text(mode) == "fast | slow"
    assert allowed_text(rate) == "above 0 per hour"
    assert field_schema(Toy, "keep") == {
        "description": "How many to keep.",
        "type": "integer",
        "minimum": 2,
        "maximum": 10,
        "default": 3,
    }
    assert field_schema(Toy, "mode")["enum"] == ["fast", "slow"]


def test_records_built_in_code_are_checked_as_the_file_is() -> None:
    with pytest.raises(ValueError, match="must be at least 2"):
        Toy(name="n", keep=1)
    with pytest.raises(ValueError, match="larger than the effective batch"):
        Batch(effective=4, micro=8)
    with pytest.raises(ValueError, match="patience"):
        EarlyStopConfig(metric="m", patience=0)


def test_every_declared_field_of_every_section_has_its_row_and_schema() -> None:
    rows = {f.path: f for f in TASK_FIELDS}
    for section, record in RECORDS.items():
        for field in declared(record):
            row = rows[f"{section}.{field.name}"]
            assert field.meta is not None and row.doc == field.meta.description
            assert row.schema is not None or row.path in RECORDS  # a section's schema is built from its rows
    assert {"skygreen.gpu_count", "skygreen.precision", "skygreen.batch.micro"} <= rows.keys()
    assert len(declared(GreenSpec)) >= 10


def test_help_imports_no_task_model() -> None:
    probe = (
        "import sys\nfrom skygreen.cli import main\nsys.argv = ['skygreen', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith(('skygreen.task', 'msgspec', 'pydantic'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "[]"
