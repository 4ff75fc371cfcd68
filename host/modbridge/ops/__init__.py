"""Operations: what a person does with a module and a host, as library functions the
CLI wraps thinly (control, console, calibration, diagnosis, recordings)."""
