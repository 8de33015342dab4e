"""Small pure utilities behind the familiar module paths (`accel.utils.*`, `accel.commands.*`)
that no leaf package owns: import probes, version checks, environment helpers, constants,
and the stubs for features accel leaves out."""
