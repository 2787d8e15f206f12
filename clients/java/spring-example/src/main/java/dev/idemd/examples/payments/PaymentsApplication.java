package dev.idemd.examples.payments;

import dev.idemd.client.Execution;
import dev.idemd.client.IdemdClient;
import dev.idemd.servlet.IdempotencyFilter;
import dev.idemd.servlet.Route;
import jakarta.servlet.http.HttpServletRequest;
import java.time.Duration;
import java.util.Map;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.boot.web.servlet.FilterRegistrationBean;
import org.springframework.context.annotation.Bean;
import org.springframework.http.HttpStatus;
import org.springframework.http.ResponseEntity;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestBody;
import org.springframework.web.bind.annotation.RestController;

/**
 * Example: {@code POST /v1/payments} made safe to retry with idemd in a Spring Boot application,
 * by registering the idemd servlet filter. The filter answers what {@code idemd proxy} answers
 * (docs/proxy.md): 400 for a missing or malformed {@code Idempotency-Key}, the stored response with
 * {@code Idempotent-Replayed: true} on a retry, 409 {@code request_in_progress} with {@code
 * Retry-After}, 409 {@code outcome_pending}, 422 {@code idempotency_key_reuse}. The controller only
 * charges.
 *
 * <p>Run it: {@code java -jar ... --idemd.address=localhost:50051 --idemd.token=...}.
 */
@SpringBootApplication
public class PaymentsApplication {
  /** The idemd client, closed with the application. */
  @Bean(destroyMethod = "close")
  IdemdClient idemdClient(
      @Value("${idemd.address:localhost:50051}") String address,
      @Value("${idemd.token:}") String token) {
    IdemdClient.Builder builder = IdemdClient.builder(address).plaintext();
    return token.isEmpty() ? builder.build() : builder.bearerToken(token).build();
  }

  /** The filter, in front of every route; POST /v1/payments waits up to 5 s for a duplicate. */
  @Bean
  FilterRegistrationBean<IdempotencyFilter> idempotency(IdemdClient client) {
    IdempotencyFilter filter =
        IdempotencyFilter.builder(client)
            .route(Route.path("/v1/payments").maxWait(Duration.ofSeconds(5)))
            .build();
    FilterRegistrationBean<IdempotencyFilter> registration = new FilterRegistrationBean<>(filter);
    registration.addUrlPatterns("/*");
    return registration;
  }

  @Bean
  PaymentProvider paymentProvider() {
    return new InMemoryPaymentProvider();
  }

  /** The payment as the client sends it. */
  record Payment(long amount, String currency, String customer) {}

  @RestController
  static class PaymentsController {
    private final PaymentProvider provider;

    PaymentsController(PaymentProvider provider) {
      this.provider = provider;
    }

    @PostMapping("/v1/payments")
    ResponseEntity<Map<String, Object>> pay(@RequestBody Payment payment, HttpServletRequest request)
        throws Exception {
      if (payment.amount() <= 0 || payment.currency() == null) {
        return ResponseEntity.badRequest().body(Map.of("error", "invalid_payment"));
      }
      // The provider's key is derived from ours: the same on every retry.
      Execution execution = (Execution) request.getAttribute(IdempotencyFilter.EXECUTION_ATTRIBUTE);
      PaymentProvider.Charge charge =
          provider.charge(execution.downstreamKey("charge"), payment.amount(), payment.currency(),
              payment.customer());
      return ResponseEntity.status(HttpStatus.CREATED)
          .body(Map.of("id", charge.id(), "status", "succeeded", "amount", charge.amount(),
              "currency", charge.currency()));
    }
  }

  public static void main(String[] args) {
    SpringApplication.run(PaymentsApplication.class, args);
  }
}
