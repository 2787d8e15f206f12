package dev.idemd.client.json;

import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;

/**
 * RFC 6901 JSON Pointers as fingerprint v1 uses them: to drop volatile fields before hashing.
 *
 * <p>Every pointer refers to the document as given: all pointers are resolved first, then the
 * deepest and highest-indexed locations are removed first, so removing {@code /items/1} and {@code
 * /items/3} removes the second and fourth elements. A pointer that resolves to nothing is ignored.
 */
public final class JsonPointer {
  private JsonPointer() {}

  /** Thrown for a pointer that cannot be used. */
  public static final class InvalidPointerException extends Exception {
    private static final long serialVersionUID = 1L;

    InvalidPointerException(String message) {
      super(message);
    }
  }

  /**
   * Splits a pointer into its unescaped reference tokens.
   *
   * @throws InvalidPointerException for the empty pointer (the whole document), a pointer without
   *     a leading {@code /}, or a {@code ~} escape other than {@code ~0} and {@code ~1}
   */
  public static List<String> parse(String pointer) throws InvalidPointerException {
    if (pointer.isEmpty()) {
      throw new InvalidPointerException("must not be the empty pointer (the whole document)");
    }
    if (pointer.charAt(0) != '/') {
      throw new InvalidPointerException("must start with '/' (RFC 6901 JSON Pointer)");
    }
    List<String> tokens = new ArrayList<>();
    StringBuilder token = new StringBuilder();
    for (int i = 1; i <= pointer.length(); i++) {
      if (i == pointer.length() || pointer.charAt(i) == '/') {
        tokens.add(token.toString());
        token.setLength(0);
        continue;
      }
      char c = pointer.charAt(i);
      if (c == '~') {
        char next = i + 1 < pointer.length() ? pointer.charAt(i + 1) : '\0';
        if (next == '0') {
          token.append('~');
        } else if (next == '1') {
          token.append('/');
        } else {
          throw new InvalidPointerException(
              "has an invalid '~' escape (only ~0 and ~1 are allowed)");
        }
        i++;
      } else {
        token.append(c);
      }
    }
    return tokens;
  }

  /**
   * Removes, in place, every location the parsed pointers refer to in {@code document} (a value of
   * the {@link StrictJson} model with mutable containers).
   */
  public static void removeAll(Object document, List<List<String>> pointers) {
    List<int[]> paths = new ArrayList<>();
    for (List<String> tokens : pointers) {
      int[] path = resolve(document, tokens);
      if (path != null && path.length > 0 && paths.stream().noneMatch(p -> compare(p, path) == 0)) {
        paths.add(path);
      }
    }
    paths.sort(JsonPointer::compare);
    for (int i = paths.size() - 1; i >= 0; i--) {
      remove(document, paths.get(i));
    }
  }

  /** The location as positions (member position in document order, or element index). */
  private static int[] resolve(Object value, List<String> tokens) {
    int[] path = new int[tokens.size()];
    for (int depth = 0; depth < tokens.size(); depth++) {
      String token = tokens.get(depth);
      if (value instanceof Map<?, ?> map) {
        if (!map.containsKey(token)) {
          return null;
        }
        int position = 0;
        for (Object name : map.keySet()) {
          if (name.equals(token)) {
            break;
          }
          position++;
        }
        path[depth] = position;
        value = map.get(token);
      } else if (value instanceof List<?> list) {
        int index = arrayIndex(token);
        if (index < 0 || index >= list.size()) {
          return null;
        }
        path[depth] = index;
        value = list.get(index);
      } else {
        return null;
      }
    }
    return path;
  }

  /** RFC 6901 array index: "0" or digits without a leading zero; -1 when not an index. */
  private static int arrayIndex(String token) {
    if (token.isEmpty() || token.length() > 9 || (token.length() > 1 && token.charAt(0) == '0')) {
      return -1;
    }
    for (int i = 0; i < token.length(); i++) {
      if (token.charAt(i) < '0' || token.charAt(i) > '9') {
        return -1;
      }
    }
    return Integer.parseInt(token);
  }

  private static int compare(int[] a, int[] b) {
    return java.util.Arrays.compare(a, b);
  }

  private static void remove(Object value, int[] path) {
    Object current = value;
    for (int depth = 0; depth < path.length - 1; depth++) {
      current = child(current, path[depth]);
      if (current == null) {
        return;
      }
    }
    int last = path[path.length - 1];
    if (current instanceof Map<?, ?> map) {
      Iterator<?> names = map.keySet().iterator();
      for (int i = 0; names.hasNext(); i++) {
        names.next();
        if (i == last) {
          names.remove();
          return;
        }
      }
    } else if (current instanceof List<?> list && last < list.size()) {
      list.remove(last);
    }
  }

  private static Object child(Object container, int position) {
    if (container instanceof Map<?, ?> map) {
      Iterator<?> values = map.values().iterator();
      for (int i = 0; values.hasNext(); i++) {
        Object v = values.next();
        if (i == position) {
          return v;
        }
      }
    } else if (container instanceof List<?> list && position < list.size()) {
      return list.get(position);
    }
    return null;
  }
}
