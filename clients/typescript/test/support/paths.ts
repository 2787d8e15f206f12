import * as path from "node:path";

/** clients/typescript (this file compiles to dist/test/support/). */
export const sdkRoot = path.resolve(__dirname, "..", "..", "..");
/** The repository root. */
export const repoRoot = path.resolve(sdkRoot, "..", "..");
export const conformanceDir = path.join(repoRoot, "clients", "conformance");
