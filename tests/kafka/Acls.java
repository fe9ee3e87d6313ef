// Grants ACLs on a Kafka cluster with the Java admin client, since the tests install only the
// broker's jars (no kafka-acls tool).
//
// Usage: java -cp '<kafka libs>/*' Acls.java BOOTSTRAP PRINCIPAL RESOURCE:PATTERN:OPERATION:NAME...
//   e.g. TOPIC:LITERAL:ALL:siphon.state, GROUP:PREFIXED:READ:siphon, CLUSTER:LITERAL:IDEMPOTENT_WRITE:kafka-cluster
// Each is an ALLOW for PRINCIPAL from any host. Exits non-zero if the broker refuses one.
//        java -cp '<kafka libs>/*' Acls.java BOOTSTRAP PRINCIPAL --revoke-all
//   deletes every ACL of PRINCIPAL, on any resource.

import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AccessControlEntryFilter;
import org.apache.kafka.common.acl.AclBindingFilter;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePatternFilter;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourceType;

public class Acls {
    public static void main(String[] args) throws Exception {
        if (args.length < 3) {
            System.err.println("usage: Acls BOOTSTRAP PRINCIPAL RESOURCE:PATTERN:OPERATION:NAME...");
            System.exit(2);
        }
        if (args[2].equals("--revoke-all")) {
            Properties properties = new Properties();
            properties.put("bootstrap.servers", args[0]);
            AclBindingFilter all = new AclBindingFilter(ResourcePatternFilter.ANY,
                    new AccessControlEntryFilter(args[1], null, AclOperation.ANY, AclPermissionType.ANY));
            try (Admin admin = Admin.create(properties)) {
                admin.deleteAcls(List.of(all)).all().get();
            }
            return;
        }
        List<AclBinding> bindings = new ArrayList<>();
        for (int i = 2; i < args.length; i++) {
            String[] part = args[i].split(":", 4);
            if (part.length != 4) {
                System.err.println("not RESOURCE:PATTERN:OPERATION:NAME: " + args[i]);
                System.exit(2);
            }
            bindings.add(new AclBinding(
                    new ResourcePattern(ResourceType.valueOf(part[0]), part[3], PatternType.valueOf(part[1])),
                    new AccessControlEntry(args[1], "*", AclOperation.valueOf(part[2]), AclPermissionType.ALLOW)));
        }
        Properties properties = new Properties();
        properties.put("bootstrap.servers", args[0]);
        try (Admin admin = Admin.create(properties)) {
            admin.createAcls(bindings).all().get();
        }
    }
}
