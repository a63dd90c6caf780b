"""gpuprov: GPU machines from whichever cloud can supply them now, given back when done."""

__version__ = "0.1.0"
