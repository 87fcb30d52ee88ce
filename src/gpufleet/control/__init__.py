"""The control loop: observe -> snapshot -> decide -> apply, the same live and in the simulator."""
