"""Measuring the served pipeline: the check's and the sweep's runs, reports and figures."""
