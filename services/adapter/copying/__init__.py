"""COPY: tables filled from, and queries written to, text, CSV and Parquet data."""
