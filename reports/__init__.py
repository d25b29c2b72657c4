"""Reports: tables and plots regenerated from the result store only (never recomputing metrics)."""
