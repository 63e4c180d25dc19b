// SPDX-License-Identifier: Apache-2.0
//
// Private to src/mlir: the table of functions resolved from
// libIREECompiler.so. Nothing outside this folder includes it.
//
// mlir* prototypes come from Debian's LLVM 22 mlir-c headers; the table
// stores `__typeof__(fn)*` so that a signature mismatch is a compile error
// here rather than a silent ABI break at a call site. Only functions whose
// signature has been stable for many LLVM releases and which take or return
// by value nothing but opaque handle structs ({void* ptr}), MlirStringRef,
// MlirLogicalResult, scalars and enums are listed (docs/decisions.md).
//
// The IREE embedding API ships no headers in the wheel, so its few functions
// are declared here, matching compiler/bindings/c/iree/compiler/
// embedding_api.h and mlir_interop.h. They are declarations only: nothing
// links against them, the table gets their addresses from dlsym.

#ifndef PCP_MLIR_LOADER_IMPL_H_
#define PCP_MLIR_LOADER_IMPL_H_

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Diagnostics.h>
#include <mlir-c/IR.h>
#include <mlir-c/Support.h>

#include "base/base.h"

// The embedding API version this code was written against. The loader
// accepts the same major version and any minor at least this one.
#define PCP_MLIR_IREE_API_MAJOR 1
#define PCP_MLIR_IREE_API_MINOR_MIN 1

// NOLINTBEGIN(readability-identifier-naming): IREE's names, not ours.
int ireeCompilerGetAPIVersion(void);
void ireeCompilerGlobalInitialize(void);
// API >= 1.1. The string is owned by the library.
const char* ireeCompilerGetRevision(void);
// Appends every dialect the compiler and its default plugins register
// (StableHLO and CHLO come from the input plugin) to |registry|.
void ireeCompilerRegisterDialects(MlirDialectRegistry registry);
// NOLINTEND(readability-identifier-naming)

// X(name) for every symbol the module uses; all are required.
#define PCP_MLIR_API_SYMBOLS(X)                 \
  X(ireeCompilerGetAPIVersion)                  \
  X(ireeCompilerGlobalInitialize)               \
  X(ireeCompilerGetRevision)                    \
  X(ireeCompilerRegisterDialects)               \
  X(mlirAttributeIsAString)                     \
  X(mlirAttributeIsAType)                       \
  X(mlirBlockGetArgument)                       \
  X(mlirBlockGetFirstOperation)                 \
  X(mlirBlockGetNextInRegion)                   \
  X(mlirBlockGetNumArguments)                   \
  X(mlirContextAttachDiagnosticHandler)         \
  X(mlirContextCreateWithRegistry)              \
  X(mlirContextDestroy)                         \
  X(mlirDiagnosticGetLocation)                  \
  X(mlirDiagnosticGetNote)                      \
  X(mlirDiagnosticGetNumNotes)                  \
  X(mlirDiagnosticGetSeverity)                  \
  X(mlirDiagnosticPrint)                        \
  X(mlirDialectRegistryCreate)                  \
  X(mlirDialectRegistryDestroy)                 \
  X(mlirFunctionTypeGetInput)                   \
  X(mlirFunctionTypeGetNumInputs)               \
  X(mlirFunctionTypeGetNumResults)              \
  X(mlirFunctionTypeGetResult)                  \
  X(mlirIdentifierStr)                          \
  X(mlirLocationCallSiteGetCallee)              \
  X(mlirLocationFileLineColRangeGetFilename)    \
  X(mlirLocationFileLineColRangeGetStartColumn) \
  X(mlirLocationFileLineColRangeGetStartLine)   \
  X(mlirLocationFusedGetLocations)              \
  X(mlirLocationFusedGetNumLocations)           \
  X(mlirLocationIsACallSite)                    \
  X(mlirLocationIsAFileLineColRange)            \
  X(mlirLocationIsAFused)                       \
  X(mlirLocationIsAName)                        \
  X(mlirLocationNameGetChildLoc)                \
  X(mlirLocationPrint)                          \
  X(mlirModuleCreateParse)                      \
  X(mlirModuleDestroy)                          \
  X(mlirModuleGetBody)                          \
  X(mlirModuleGetOperation)                     \
  X(mlirOpPrintingFlagsCreate)                  \
  X(mlirOpPrintingFlagsDestroy)                 \
  X(mlirOpPrintingFlagsPrintGenericOpForm)      \
  X(mlirOpPrintingFlagsUseLocalScope)           \
  X(mlirOperationGetInherentAttributeByName)    \
  X(mlirOperationGetLocation)                   \
  X(mlirOperationGetName)                       \
  X(mlirOperationGetNextInBlock)                \
  X(mlirOperationGetNumOperands)                \
  X(mlirOperationGetNumRegions)                 \
  X(mlirOperationGetNumResults)                 \
  X(mlirOperationGetOperand)                    \
  X(mlirOperationGetRegion)                     \
  X(mlirOperationGetResult)                     \
  X(mlirOperationPrintWithFlags)                \
  X(mlirOperationVerify)                        \
  X(mlirRegionGetFirstBlock)                    \
  X(mlirShapedTypeGetDimSize)                   \
  X(mlirShapedTypeGetElementType)               \
  X(mlirShapedTypeGetRank)                      \
  X(mlirShapedTypeIsDynamicDim)                 \
  X(mlirStringAttrGetValue)                     \
  X(mlirTypeAttrGetValue)                       \
  X(mlirTypeIsAFloat)                           \
  X(mlirTypeIsAFunction)                        \
  X(mlirTypeIsAIndex)                           \
  X(mlirTypeIsAInteger)                         \
  X(mlirTypeIsARankedTensor)                    \
  X(mlirTypeIsAUnrankedTensor)                  \
  X(mlirTypePrint)                              \
  X(mlirValueGetType)

typedef struct pcp_mlir_api_t {
// A declarator name cannot be parenthesized.
// NOLINTNEXTLINE(bugprone-macro-parentheses)
#define PCP_MLIR_API_FIELD_(name) __typeof__(name)* name;
  PCP_MLIR_API_SYMBOLS(PCP_MLIR_API_FIELD_)
#undef PCP_MLIR_API_FIELD_
} pcp_mlir_api_t;

// Loads the library (pcp_mlir_library_load) and returns the table through
// |out_api|. The table is immutable after loading and lives for the process.
PCP_MUST_USE_RESULT pcp_status_t
pcp_mlir_api_get(const pcp_mlir_api_t** out_api);

#endif  // PCP_MLIR_LOADER_IMPL_H_
