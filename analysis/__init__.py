"""Figures and tables computed from the Parquet results store only (never re-trains)."""
