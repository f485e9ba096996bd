"""The rehearsal machine of tests/test_rehearsal.py: rehearsal.sh and the Jetson-shaped stubs (jetson.py)."""
