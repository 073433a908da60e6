"""Deployment artefacts: the Marathon group for DC/OS (`render`)."""
