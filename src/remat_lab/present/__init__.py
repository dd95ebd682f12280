"""Presentation: results -> DataFrames, DataFrames -> Plotly figures, configurations -> code."""
