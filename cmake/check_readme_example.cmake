# Fails unless the README's C example is exactly examples/fp8_roundtrip.c,
# so the example a reader copies is the one the test suite builds and runs.
file(READ ${README} readme)
file(READ ${EXAMPLE} example)
string(FIND "${readme}" "```c\n${example}```" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR "README.md's C example differs from ${EXAMPLE}; paste the file into the README's ```c block")
endif()
message(STATUS "README example matches ${EXAMPLE}")
