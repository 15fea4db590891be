"""The bottom of the house: rows and results, errors, the run-folder store, prompt data, layer resolution and the
plugin contract (``plugin``: Params, Result, Line, Figure, Kind, PlanItem; ``registry``). Imports nothing above it."""
