// Sets a user's SCRAM credential on a Kafka cluster with the Java admin client (the tests install
// only the broker's jars, no kafka-configs tool): creates it, or replaces the password of one that
// exists, as an operator rotating a password does.
//
// Usage: java -cp '<kafka libs>/*' ScramCredential.java BOOTSTRAP USER MECHANISM PASSWORD
//   MECHANISM is SCRAM-SHA-256 or SCRAM-SHA-512. Exits non-zero if the broker refuses it.

import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ScramCredentialInfo;
import org.apache.kafka.clients.admin.ScramMechanism;
import org.apache.kafka.clients.admin.UserScramCredentialUpsertion;

public class ScramCredential {
    /// Iterations of the credential's key derivation (Kafka's minimum).
    private static final int ITERATIONS = 4096;

    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.err.println("usage: ScramCredential BOOTSTRAP USER MECHANISM PASSWORD");
            System.exit(2);
        }
        ScramMechanism mechanism = ScramMechanism.fromMechanismName(args[2]);
        if (mechanism == ScramMechanism.UNKNOWN) {
            System.err.println("not a SCRAM mechanism: " + args[2]);
            System.exit(2);
        }
        Properties properties = new Properties();
        properties.put("bootstrap.servers", args[0]);
        try (Admin admin = Admin.create(properties)) {
            admin.alterUserScramCredentials(List.of(new UserScramCredentialUpsertion(
                    args[1], new ScramCredentialInfo(mechanism, ITERATIONS), args[3])))
                    .all()
                    .get();
        }
    }
}
