// Selection of the CPU kernels' instruction-set build (implemented in isa.cpp; the table
// and its contract are in isa.h). Not included by the per-ISA translation units.
#pragma once

#include <string>
#include <vector>

#include "cpu/isa.h"

namespace domino::cpu {

// Name of the build kernels() returns (raises like kernels() for a bad DOMINO_CPU_ISA).
std::string active_isa();
// Builds compiled into this extension, widest first, and those this CPU can run.
std::vector<std::string> compiled_isas();
std::vector<std::string> supported_isas();
// Tests and benchmarks: run `name` ("auto" or a build name) from now on, or go back to
// DOMINO_CPU_ISA / auto with an empty name. Raises c10::ValueError like DOMINO_CPU_ISA.
void force_isa(const std::string& name);
// The CPU's brand string with its family and model numbers.
std::string cpu_model();

}  // namespace domino::cpu
