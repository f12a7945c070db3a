# Included into llama-cpp-python's build by the README's install command (CMAKE_PROJECT_INCLUDE).
#
# GCC before 14 declares that `_tile_loadconfig` reads only the first 8 bytes of the 64-byte AMX tile
# configuration, so the stores of the tile shapes are removed as dead stores and llama.cpp's AMX
# kernels die at their first tile instruction (llama.cpp's own fix, not yet released: the configuration
# kept in read-only data). Without dead-store elimination the stores stay. Other compilers (clang) are
# not affected and do not know these flags.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 14)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fno-tree-dse> $<$<COMPILE_LANGUAGE:CXX>:-fno-dse>)
endif()
