# Fails unless each example program appears verbatim in a ```c block of the
# README, so the code a reader copies is the code the test suite builds and
# runs.
file(READ ${README} readme)
foreach(example ${EXAMPLES})
  file(READ ${example} text)
  string(FIND "${readme}" "```c\n${text}```" pos)
  if(pos EQUAL -1)
    message(FATAL_ERROR "README.md has no ```c block equal to ${example}; paste the file into the README")
  endif()
  message(STATUS "README holds ${example}")
endforeach()
