"""Loaded at the start of every Python process whose PYTHONPATH holds this folder (tests only): arms the
fault injection of faultplug.py when a test's environment asks for one."""
import os

if any(os.environ.get(k) for k in ("RMDM_FAULT_NAN_AT", "RMDM_FAULT_HOLD_AT", "RMDM_FAULT_FILE")):
    import faultplug

    faultplug.arm()
