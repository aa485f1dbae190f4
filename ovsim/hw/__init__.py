"""Hardware as data: GPU and system specs, calibration files, and the power model."""
