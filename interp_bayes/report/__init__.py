"""Reports built from a run folder alone: summary tables, plotly figures and one self-contained HTML page."""
