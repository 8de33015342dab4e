"""Small pure utilities behind the familiar module paths (`accel.utils.*`, `accel.commands.*`)
that no leaf package owns: import probes, version checks, environment helpers, constants,
and the stubs for features accel leaves out.

Each module is named after the accelerate path it serves (`_utils_other` serves
`accelerate.utils.other`, `_state` serves `accelerate.state`); `_left_out` and `_unsupported`
hold the stand-ins for left-out features, whatever path names them."""
