"""The notification lifecycle, in one place: its states, its moves as data, and the moves themselves.

* :mod:`~dispatcher.lifecycle.states`: the states of a notification and of an attempt, their
  order, and the pure rules over them (a report only moves a state forward);
* :mod:`~dispatcher.lifecycle.table`: every allowed move, as data (start and end states per side);
* :mod:`~dispatcher.lifecycle.moves`: each move as one named compare-and-set, which answers
  whether it won. Nothing else writes a ``state`` column (tests/unit/lifecycle proves it);
* :mod:`~dispatcher.lifecycle.diagram`: docs/lifecycle.md's drawing, made from the table.
"""
