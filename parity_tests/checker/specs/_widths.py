"""The hooks every spec of a family built by ``battery.widths`` shares (the sparse, linear and
serving specs): its default battery (which is also its quick one: the cases are small), a case
by name, the refusal of another family's case, a row with every option off, and the random row
of its fuzzer. A family's base class names its case types (``case_types``) and says what its
cases are (``family``, for the refusal's words).

Tests: tests/checker/test_spec.py, tests/checker/specs/
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from ..battery import pairs
from ..battery.widths import default_battery
from ..spec import Spec


class WidthBatterySpec(Spec):
    """A spec whose battery ``battery.widths.default_battery`` builds (see the module
    docstring)."""

    # The case types of the family, and what its cases are ("sparse cases").
    case_types: ClassVar[tuple[type, ...]]
    family: ClassVar[str]
    batteries = ("default", "quick")

    def battery(self, name: str, claimed: frozenset[str] | None) -> tuple[Any, ...]:
        # The family's cases are small: the default battery is the quick one too.
        return self.claimed_battery(lambda key: default_battery(self, key), claimed)

    def default_battery(self, claimed: frozenset[str] | None = None) -> tuple[Any, ...]:
        """The battery built for ``claimed`` (None: every feature)."""
        return default_battery(self, self.claim_key(claimed))

    def lookup(self, name: str, claimed: frozenset[str] | None) -> Any:
        for key in (self.claim_key(claimed), None):
            for case in default_battery(self, key):
                if case.name == name:
                    return case
        raise ValueError(f"unknown {self.name} case {name!r}; --list-cases --spec {self.name} "
                         "names them")  # fmt: skip

    def cannot_express(self, case: Any) -> str | None:
        if not isinstance(case, self.case_types) or case.spec != self.name:
            what = getattr(case, "spec", type(case).__name__)
            return f"the {self.name} spec runs its own {self.family}, not those of {what}"
        return None

    def row_for(self, requirement: Any, claimed: frozenset[str] | None) -> pairs.Row:
        """A row with every option off."""
        return {factor: values[0] for factor, values in pairs.space(self, claimed).items()}

    def fuzz_row(self, index: int, seed: int, claimed: frozenset[str] | None
                 ) -> tuple[pairs.Row, random.Random]:  # fmt: skip
        """Row ``index`` of the fuzzer for ``seed``: each factor a value drawn among those a
        case can still hold; and the generator, for the rest of the case's draws."""
        claim = None if claimed is None else sorted(claimed)
        rng = random.Random(f"fuzz {self.name} {seed} {index} {claim}")
        domains = pairs.space(self, claimed)
        row: pairs.Row = {}
        for factor, values in domains.items():
            held = [v for v in values if pairs.extendable(self, domains, {**row, factor: v})]
            row[factor] = rng.choice(held)
        return row, rng
