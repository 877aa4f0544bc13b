# Script mode: cmake -DIN=file -DOUT=file.c -DSYMBOL=name -P tp_embed.cmake
# Writes `const char SYMBOL[] = {bytes..., 0};` and `const unsigned long SYMBOL_len`
# so a text file (configs/shapes.json) is built into the binary without
# over-long string literals (-Wpedantic).
file(READ "${IN}" _hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," _bytes "${_hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" _bytes "${_bytes}")
string(LENGTH "${_hex}" _n)
math(EXPR _n "${_n} / 2")
file(WRITE "${OUT}.tmp" "/* generated from ${IN} by cmake/tp_embed.cmake - do not edit */\n"
  "extern const char ${SYMBOL}[];\nextern const unsigned long ${SYMBOL}_len;\n"
  "const char ${SYMBOL}[] = {\n${_bytes}0};\nconst unsigned long ${SYMBOL}_len = ${_n};\n")
file(RENAME "${OUT}.tmp" "${OUT}")
