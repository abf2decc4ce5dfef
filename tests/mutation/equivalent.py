"""Mutants shown to be equivalent: each key (see ``engine.Mutant.key``) with the reason the mutated
operator cannot differ from the reference on any input the operator accepts. The mutation runner
reports a surviving mutant that is not listed here as a survivor."""

EQUIVALENT: dict[str, str] = {}
