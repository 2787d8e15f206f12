/**
 * Decoding of the rich error model (`grpc-status-details-bin`: a `google.rpc.Status` whose
 * details hold `google.rpc.ErrorInfo` and `google.rpc.BadRequest`). These three messages are
 * tiny and stable, so they are read with the protobuf wire reader instead of generating stubs
 * for googleapis protos that protoc does not ship.
 */
import { BinaryReader, WireType } from "@bufbuild/protobuf/wire";
import type { Metadata } from "@grpc/grpc-js";

export interface ErrorInfo {
  reason: string;
  domain: string;
  metadata: Record<string, string>;
}

export interface FieldViolation {
  field: string;
  description: string;
}

export interface StatusDetails {
  errorInfo?: ErrorInfo;
  fieldViolations: FieldViolation[];
}

const ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo";
const BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest";

/** Reads the ErrorInfo and BadRequest details of a failed call's trailers (best effort). */
export function decodeStatusDetails(metadata: Metadata): StatusDetails {
  const result: StatusDetails = { fieldViolations: [] };
  const raw = metadata.get("grpc-status-details-bin")[0];
  if (raw === undefined || typeof raw === "string") return result;
  try {
    forEachField(raw, (field, reader) => {
      if (field !== 3) return false; // Status.details (repeated Any)
      let typeUrl = "";
      let value: Uint8Array = new Uint8Array(0);
      forEachField(reader.bytes(), (anyField, any) => {
        if (anyField === 1) typeUrl = any.string();
        else if (anyField === 2) value = any.bytes();
        else return false;
        return true;
      });
      if (typeUrl === ERROR_INFO) result.errorInfo = decodeErrorInfo(value);
      else if (typeUrl === BAD_REQUEST) result.fieldViolations.push(...decodeBadRequest(value));
      return true;
    });
  } catch {
    // Malformed details never hide the status itself.
  }
  return result;
}

function decodeErrorInfo(bytes: Uint8Array): ErrorInfo {
  const info: ErrorInfo = { reason: "", domain: "", metadata: {} };
  forEachField(bytes, (field, reader) => {
    if (field === 1) info.reason = reader.string();
    else if (field === 2) info.domain = reader.string();
    else if (field === 3) {
      let key = "";
      let value = "";
      forEachField(reader.bytes(), (entryField, entry) => {
        if (entryField === 1) key = entry.string();
        else if (entryField === 2) value = entry.string();
        else return false;
        return true;
      });
      info.metadata[key] = value;
    } else return false;
    return true;
  });
  return info;
}

function decodeBadRequest(bytes: Uint8Array): FieldViolation[] {
  const violations: FieldViolation[] = [];
  forEachField(bytes, (field, reader) => {
    if (field !== 1) return false;
    const violation: FieldViolation = { field: "", description: "" };
    forEachField(reader.bytes(), (vField, v) => {
      if (vField === 1) violation.field = v.string();
      else if (vField === 2) violation.description = v.string();
      else return false;
      return true;
    });
    violations.push(violation);
    return true;
  });
  return violations;
}

/**
 * Calls `read` for each length-delimited field (every field read here is a string, bytes or a
 * message); a field it does not consume (returns false) and any other field is skipped.
 */
function forEachField(bytes: Uint8Array, read: (field: number, reader: BinaryReader) => boolean): void {
  const reader = new BinaryReader(bytes);
  while (reader.pos < reader.len) {
    const [field, wireType] = reader.tag();
    const consumed = wireType === WireType.LengthDelimited && read(field, reader);
    if (!consumed) reader.skip(wireType, field);
  }
}
