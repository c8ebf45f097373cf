# The explain report's page, style and script, embedded into the library at
# build time (cmake/embed_report_assets.cmake). Included from the top-level
# CMakeLists.txt after the multihead target exists.
set(_explain_assets ${CMAKE_CURRENT_SOURCE_DIR}/src/explain/assets)
set(_explain_header ${CMAKE_CURRENT_BINARY_DIR}/generated/explain/report_assets.hpp)
add_custom_command(
  OUTPUT ${_explain_header}
  COMMAND ${CMAKE_COMMAND} -DASSETS=${_explain_assets} -DOUT=${_explain_header}
          -P ${CMAKE_CURRENT_SOURCE_DIR}/cmake/embed_report_assets.cmake
  DEPENDS ${_explain_assets}/report.html ${_explain_assets}/report.css ${_explain_assets}/report.js
          ${CMAKE_CURRENT_SOURCE_DIR}/cmake/embed_report_assets.cmake
  COMMENT "Embedding the explain report's page, style and script")
target_sources(multihead PRIVATE ${_explain_header})
target_include_directories(multihead PRIVATE ${CMAKE_CURRENT_BINARY_DIR}/generated)
