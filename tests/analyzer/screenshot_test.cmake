# Screenshot test of the HTML report: headless Chromium renders it, and the PNG must exist and be a
# real image of a real page (size well above a blank page's).  Look at WORK/report.png by eye when
# the HTML writer changes.
# The page of an earlier run must not stand in for one this run failed to write.
file(REMOVE ${WORK}/report.html)
execute_process(COMMAND ${GPUMEM} report --no-progress --html ${WORK}/report.html ${DATA}/golden/pool_fragmentation.jsonl
  OUTPUT_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT EXISTS ${WORK}/report.html)
  message(FATAL_ERROR "gpumem report --html failed (exit ${rc}) or wrote no ${WORK}/report.html")
endif()
file(REMOVE ${WORK}/report.png)
execute_process(COMMAND ${CHROMIUM} --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1150,1800
  --screenshot=${WORK}/report.png file://${WORK}/report.html
  OUTPUT_QUIET ERROR_QUIET RESULT_VARIABLE rc TIMEOUT 60)
if(NOT EXISTS ${WORK}/report.png)
  message(FATAL_ERROR "chromium wrote no screenshot (rc ${rc})")
endif()
file(SIZE ${WORK}/report.png size)
file(READ ${WORK}/report.png magic LIMIT 8 HEX)
if(NOT magic STREQUAL "89504e470d0a1a0a")
  message(FATAL_ERROR "report.png is not a PNG")
endif()
# A blank 1150x1800 page compresses to a few KB; charts, maps and tables make it far larger.
if(size LESS 40000)
  message(FATAL_ERROR "report.png is only ${size} bytes: the page looks empty")
endif()
message(STATUS "screenshot ${WORK}/report.png, ${size} bytes")
