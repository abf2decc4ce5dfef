"""Pure check functions: each returns a CheckResult naming the worst element, row and bound."""
