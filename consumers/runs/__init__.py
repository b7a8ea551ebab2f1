"""Drivers over a deployment: a whole pipeline run, the capacity search, a run's figures,
redriving dead letters."""
