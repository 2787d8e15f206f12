package dev.idemd.client.testing;

import java.io.IOException;
import java.io.UncheckedIOException;
import org.junit.jupiter.api.extension.ExtensionContext;
import org.junit.jupiter.api.extension.ParameterContext;
import org.junit.jupiter.api.extension.ParameterResolver;

/**
 * Gives tests the shared conformance server: one idemd process for the whole test run, started on
 * first use and stopped (SIGTERM) when the run ends.
 */
public final class LiveIdemd implements ParameterResolver {
  private static final ExtensionContext.Namespace NAMESPACE =
      ExtensionContext.Namespace.create(LiveIdemd.class);

  @Override
  public boolean supportsParameter(ParameterContext parameter, ExtensionContext context) {
    return parameter.getParameter().getType() == IdemdServer.class;
  }

  @Override
  public Object resolveParameter(ParameterContext parameter, ExtensionContext context) {
    return context
        .getRoot()
        .getStore(NAMESPACE)
        .getOrComputeIfAbsent(
            IdemdServer.class,
            k -> {
              try {
                return IdemdServer.startConformance();
              } catch (IOException e) {
                throw new UncheckedIOException(e);
              }
            },
            IdemdServer.class);
  }
}
