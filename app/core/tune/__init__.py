"""Tuning: finding the best config per request shape by racing candidates with launches as the unit.

`race` is the decision rule (pure: observations in, a Decision out; no I/O). The design and its error rates are in
docs/decisions.md ("Tune: the racing rule"). May import app.core.measure (its statistics) and the rooms below it.
"""
