# Writes INPUT as a C string constant NAME into OUTPUT (cmake -P script).
file(READ ${INPUT} content HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${content}")
get_filename_component(dir ${OUTPUT} DIRECTORY)
file(MAKE_DIRECTORY ${dir})
file(WRITE ${OUTPUT}
  "// Generated from ${INPUT}; do not edit.\n#pragma once\n"
  "static const char ${NAME}[] = {${bytes} 0x00};\n")
