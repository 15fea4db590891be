"""Reports built from a run folder alone: summary tables (and, later, figures and one HTML page)."""
