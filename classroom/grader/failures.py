"""Hidden cases of notebook 11b_failures's checks
(d2l_multi/exercises/failures.py)."""
_YEAR = 365 * 24 * 3600
HIDDEN = {
    # checkpoint_interval: (seconds to save, one device's mean time between failures, devices)
    "checkpoint_interval": [(5, 10 * _YEAR, 10**4), (60, 0.5 * _YEAR, 8)],
}
