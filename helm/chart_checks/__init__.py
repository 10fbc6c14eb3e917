"""The chart checks `helm/check_chart.py` runs, one file a job."""
