# Golden-file test: runs the real `gpumem report` on the logs in tests/data/golden and compares its
# text, stderr, JSON, HTML and Perfetto outputs byte for byte with tests/data/golden/expected/.
# Regenerate after an intended change with:  cmake -DUPDATE=1 -DGPUMEM=... -DDATA=... -DWORK=... -P golden_test.cmake
# (then review the diff: a golden file is only as good as the reading it got).
set(cases
  "pool_off_basic|pool_off_basic.jsonl"
  "pool_fragmentation|pool_fragmentation.jsonl"
  "pool_fragmentation_at|pool_fragmentation.jsonl|--at|5"
  "pool_auto|pool_auto.jsonl"
  "pool_vmm_unmap|pool_vmm_unmap.jsonl"
  "pool_vmm_map|pool_vmm_map.jsonl"
  "pool_off_kinds|pool_off_kinds.jsonl"
  "killed_truncated|killed_truncated.jsonl"
  "ranks|rank0.jsonl|rank1.jsonl"
  "stacks|stacks.jsonl"
  "oom_stack|oom_stack.jsonl"
)
cmake_policy(SET CMP0007 NEW)
set(src ${DATA}/golden)
set(exp ${DATA}/golden/expected)
file(MAKE_DIRECTORY ${WORK})
set(failed "")
foreach(c ${cases})
  string(REPLACE "|" ";" parts "${c}")
  list(GET parts 0 name)
  list(SUBLIST parts 1 -1 args)
  set(outputs
    "txt|--no-progress"
    "json|--json"
    "html|--html|${WORK}/${name}.html.out"
    "perfetto.json|--perfetto|${WORK}/${name}.perfetto.json.out")
  foreach(o ${outputs})
    string(REPLACE "|" ";" op "${o}")
    list(GET op 0 ext)
    list(SUBLIST op 1 -1 extra)
    list(REMOVE_ITEM extra "")
    # A file left by an earlier run must not stand in for one this run failed to write.
    file(REMOVE ${WORK}/${name}.${ext}.out)
    execute_process(COMMAND ${GPUMEM} report --no-progress ${args} ${extra}
      WORKING_DIRECTORY ${src}
      OUTPUT_FILE ${WORK}/${name}.stdout.out ERROR_FILE ${WORK}/${name}.stderr.out
      RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      list(APPEND failed "${name} (${ext}): exit code ${rc}")
      continue()
    endif()
    if(ext STREQUAL "txt")
      set(got ${WORK}/${name}.stdout.out)
      set(pairs "${WORK}/${name}.stdout.out|${exp}/${name}.txt" "${WORK}/${name}.stderr.out|${exp}/${name}.stderr")
    elseif(ext STREQUAL "json")
      set(pairs "${WORK}/${name}.stdout.out|${exp}/${name}.json")
    else()
      set(pairs "${WORK}/${name}.${ext}.out|${exp}/${name}.${ext}")
    endif()
    foreach(p ${pairs})
      string(REPLACE "|" ";" pp "${p}")
      list(GET pp 0 actual)
      list(GET pp 1 expected)
      if(UPDATE)
        configure_file(${actual} ${expected} COPYONLY)
      else()
        execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${actual} ${expected} RESULT_VARIABLE same)
        if(NOT same EQUAL 0)
          list(APPEND failed "${name}: ${actual} differs from ${expected}")
        endif()
      endif()
    endforeach()
  endforeach()
endforeach()
if(failed)
  string(REPLACE ";" "\n  " msg "${failed}")
  message(FATAL_ERROR "golden mismatches:\n  ${msg}\n(diff them; rerun with -DUPDATE=1 only if the change is intended)")
endif()
message(STATUS "all golden outputs match")
